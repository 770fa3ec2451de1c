"""LMCache's compiled ops (`lmcache.cuda_ops`) for the torch in use: which copy path an arm's LMCache runs, and the kit's own build.

LMCache 0.5.4 imports its compiled CUDA ops once per process, when `import lmcache` resolves its
device ops (`lmcache/__init__.py:23-28` → `v1/platform/base/device_spec.py:118-128` →
`v1/platform/cuda/device_ops.py:26-39`), and on ImportError logs "lmcache.cuda_ops compiled extension
not found; CudaDeviceOps stays on the torch baseline for all ops." and runs the torch fallback
(`v1/platform/torch_ops.py`) for every copy. The wheel's ops are built against one torch (2.13 for
0.5.4); under another torch they fail with an undefined symbol and LMCache silently falls back. Each
LMCache process decides for itself: the engine child and its workers, and the MP server.

`resolve()` picks, for every LMCache process of a run, the path asked for (`--lmcache-ops`):
auto (the wheel's ops if they import, else a kit build for this lmcache, torch and GPU arch if one
is cached, else LMCache's fallback, recorded with the import error), compiled (the same, but an
error when neither gives importable ops) or fallback (a control: the kit blocks the ops in every
process through `repro/engine/ops_fallback/sitecustomize.py`). `build()` compiles the ops from
LMCache's source distribution with the interpreter's own torch and nvcc into
`.cache/lmcache-ops/<lmcache>-torch<torch>-sm<arch>/`, with a manifest. No torch, vllm or lmcache
import here: other interpreters are asked in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from repro import __version__
from repro.errors import EXIT_OK, EXIT_RUNTIME, UsageError
from repro.paths import KIT_ROOT
from repro.plan.interpreter import ask_json
from repro.record.atomic import dumps_json, write_json_atomic
from repro.record.provenance import utc_now

MODES = ("auto", "compiled", "fallback")
OPS_MODULE = "lmcache.cuda_ops"
# What LMCache logs when its ops do not import (v1/platform/cuda/device_ops.py:34-37).
FALLBACK_WARNING = "lmcache.cuda_ops compiled extension not found"
BLOCKED_ERROR = "lmcache.cuda_ops blocked by the kit (--lmcache-ops fallback)"
FALLBACK_DIR = KIT_ROOT / "repro" / "engine" / "ops_fallback"
CACHE_ROOT = KIT_ROOT / ".cache" / "lmcache-ops"
MANIFEST_NAME = "kvkit-lmcache-ops.json"  # repro.engine.child reads this name to tell a kit build
MANIFEST_KIND = "kvkit-lmcache-ops-build"
# Version 1: lmcache, torch, cuda, arch, python, sdist {name, sha256}, nvcc, source_dir, ops_file,
# build_s, built_at.
SCHEMA_VERSION = 1
PROBE_TIMEOUT_S = 180  # imports torch and LMCache (and initializes CUDA to count the GPUs)
BUILD_TIMEOUT_S = 3 * 3600
CUDA_HOMES = ("/usr/local/cuda",)  # where torch's cpp_extension looks for the toolkit without CUDA_HOME

# Asked of the engine interpreter: versions and GPU arch without LMCache, then (with --ops) whether
# lmcache.cuda_ops imports and from which file. Prints one JSON line; never raises.
_PROBE = r"""
import json, sys
def first(exc):
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
out = {"python": sys.executable}
try:
    import importlib.metadata as m
    out["lmcache"] = m.version("lmcache")
except Exception as exc:
    out["lmcache"] = None
if "--ops-only" not in sys.argv:
    try:
        import torch
        out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        out["arch"] = sorted({"%d.%d" % tuple(torch.cuda.get_device_capability(i)) for i in range(n)})
    except Exception as exc:
        out.update(torch=None, cuda=None, arch=[], torch_error=first(exc))
if "--ops" in sys.argv or "--ops-only" in sys.argv:
    try:
        import lmcache
    except BaseException as exc:
        out["ops"] = {"lmcache_imports": False, "imports": False, "error": first(exc)}
    else:
        try:
            import lmcache.cuda_ops as ops
            out["ops"] = {"lmcache_imports": True, "imports": True, "file": getattr(ops, "__file__", None)}
        except BaseException as exc:
            out["ops"] = {"lmcache_imports": True, "imports": False, "error": first(exc)}
print(json.dumps(out))
"""


class BuildError(Exception):
    """The build ran and failed (exit 3): one line, the build log's path in it."""


@dataclass(frozen=True)
class OpsPlan:
    """What every LMCache process of a run gets: `env` (PYTHONPATH is prepended, anything else set;
    apply() merges it) and `provenance` (for the report's provenance under `lmcache_ops`)."""

    env: dict
    provenance: dict


def probe(
    python: str, env: dict | None = None, ops: bool = False, versions: bool = True, timeout_s: float = PROBE_TIMEOUT_S
) -> dict:
    """Ask an interpreter (in env) for lmcache/torch versions and the visible GPUs' arch (unless not
    versions) and, with ops, whether lmcache.cuda_ops imports (`ops`: lmcache_imports, imports, file or
    error); {"problem": "<one line>"} when it cannot be asked. Never raises."""
    flag = ["--ops"] if ops and versions else ["--ops-only"] if ops else []
    return ask_json([python, "-c", _PROBE, *flag], timeout_s, "did not answer the probe", env=env, who=python)


def with_pythonpath(env: dict, *dirs: str | Path) -> dict:
    """env with dirs first on PYTHONPATH (before whatever it held)."""
    parts = [str(d) for d in dirs] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    return {**env, "PYTHONPATH": os.pathsep.join(parts)}


def apply(plan: OpsPlan, env: dict) -> dict:
    """env for an LMCache process under plan: PYTHONPATH prepended with the plan's, other keys set."""
    out = dict(env)
    for name, value in plan.env.items():
        out = with_pythonpath(out, value) if name == "PYTHONPATH" else {**out, name: value}
    return out


# ---- the cache of kit builds ---------------------------------------------------------------------


def arch_key(arch: list[str] | str) -> str:
    return "+".join(arch) if isinstance(arch, list) else arch


def build_key(lmcache: str, torch: str, arch: list[str] | str) -> str:
    return f"{lmcache}-torch{torch}-sm{arch_key(arch)}"


def read_manifest(build_dir: Path) -> dict:
    """A build's manifest, checked; UsageError when it is missing, foreign or newer than this kit."""
    path = Path(build_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable build manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
        raise UsageError(f"{path}: not a {MANIFEST_KIND} manifest")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(f"{path}: schema_version {data.get('schema_version')}; this kit reads {SCHEMA_VERSION}")
    return data


def cached_build(cache_root: Path, lmcache: str, torch: str, arch: list[str] | str) -> tuple[Path, dict] | None:
    """The kit build for this key, with its manifest, or None."""
    build_dir = Path(cache_root) / build_key(lmcache, torch, arch)
    if not (build_dir / MANIFEST_NAME).is_file():
        return None
    return build_dir, read_manifest(build_dir)


def source_path(build_dir: Path, manifest: dict) -> Path:
    """The unpacked source tree that goes on PYTHONPATH (its `lmcache/` holds the built ops)."""
    return Path(build_dir) / manifest["source_dir"]


# ---- resolve -------------------------------------------------------------------------------------


def resolve(mode: str, python: str, env: dict, cache_root: Path | str = CACHE_ROOT) -> OpsPlan:
    """The plan for every LMCache process of a run (module docstring). `env` is the children's base env.
    compiled without importable ops, or an unknown mode: UsageError (one line, exit 2)."""
    if mode not in MODES:
        raise UsageError(f"--lmcache-ops {mode}: choose one of {', '.join(MODES)}")
    info = probe(python, env, ops=True)
    ops = info.get("ops") or {}
    prov: dict = {
        "mode": mode,
        "lmcache": info.get("lmcache"),
        "torch": info.get("torch"),
        "arch": arch_key(info.get("arch") or []) or None,
        "build_dir": None,
        "manifest": None,
        "wheel_import_error": None if ops.get("imports") else ops.get("error") or info.get("problem"),
    }
    if mode == "fallback":
        return OpsPlan(
            {"PYTHONPATH": str(FALLBACK_DIR)},
            {**prov, "path": "fallback", "source": None, "detail": f"forced: {BLOCKED_ERROR}"},
        )
    if ops.get("imports"):
        detail = f"the installed wheel's {ops.get('file')}"
        return OpsPlan({}, {**prov, "path": "compiled", "source": "wheel", "detail": detail})
    why = prov["wheel_import_error"] or "lmcache.cuda_ops did not import"
    if "problem" in info or not ops.get("lmcache_imports"):
        if mode == "compiled":
            raise UsageError(f"--lmcache-ops compiled: {python} cannot import lmcache ({why})")
        return OpsPlan({}, {**prov, "path": "not recorded", "source": None, "detail": f"lmcache: {why}"})
    found = _usable_build(python, env, info, Path(cache_root))
    if isinstance(found, tuple):
        build_dir, manifest, tree = found
        return OpsPlan(
            {"PYTHONPATH": str(tree)},
            {**prov, "path": "compiled", "source": "kit build", "build_dir": str(build_dir), "manifest": manifest,
             "detail": f"the kit's build in {build_dir} (the wheel's: {why})"},
        )  # fmt: skip
    if mode == "compiled":
        raise UsageError(
            f"--lmcache-ops compiled: the wheel's lmcache.cuda_ops does not import ({why}) and {found}; "
            f"build it: python -m repro lmcache-ops build --python {python} --sdist lmcache-{info.get('lmcache')}.tar.gz"
        )
    detail = f"{OPS_MODULE}: {why} ({found})"
    return OpsPlan({}, {**prov, "path": "fallback", "source": None, "detail": detail})


def _usable_build(python: str, env: dict, info: dict, cache_root: Path) -> tuple[Path, dict, Path] | str:
    """(build dir, manifest, source tree) of a cached build whose ops import, or why there is none."""
    if not info.get("arch"):
        return "no GPU is visible to tell the arch of a kit build"
    try:
        found = cached_build(cache_root, info["lmcache"], info["torch"], info["arch"])
    except UsageError as exc:
        return str(exc)
    key = build_key(info["lmcache"], info["torch"], info["arch"])
    if found is None:
        return f"no kit build {key} in {cache_root}"
    build_dir, manifest = found
    tree = source_path(build_dir, manifest)
    check = probe(python, with_pythonpath(env, tree), ops=True).get("ops") or {}
    if not check.get("imports"):
        return f"the kit build {build_dir} does not import either ({check.get('error')})"
    return build_dir, manifest, tree


# ---- build ---------------------------------------------------------------------------------------


def sdist_version(sdist: Path) -> tuple[str, str]:
    """(top folder, version) from an sdist's PKG-INFO; UsageError when it is not an LMCache sdist."""
    try:
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar.getmembers() if re.fullmatch(r"[^/]+/PKG-INFO", m.name)), None)
            text = tar.extractfile(member).read().decode("utf-8", "replace") if member else ""
    except (OSError, tarfile.TarError) as exc:
        raise UsageError(f"--sdist {sdist}: not a readable source distribution ({exc})") from None
    name = re.search(r"^Name:\s*(\S+)", text, re.MULTILINE)
    version = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
    if member is None or not name or name.group(1).lower() != "lmcache" or not version:
        raise UsageError(f"--sdist {sdist}: not an LMCache source distribution (no lmcache PKG-INFO at its top)")
    return member.name.split("/")[0], version.group(1)


def find_nvcc(env: dict) -> str | None:
    """nvcc as LMCache's setup.py finds it (on PATH), else CUDA_HOME's or /usr/local/cuda's."""
    found = shutil.which("nvcc", path=env.get("PATH"))
    for home in (env.get("CUDA_HOME"), *CUDA_HOMES):
        if not found and home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            found = os.path.join(home, "bin", "nvcc")
    return found


def nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(
    python: str,
    sdist: Path | str,
    cache_root: Path | str = CACHE_ROOT,
    arch: str | None = None,
    env: dict | None = None,
    max_jobs: int | None = None,
) -> tuple[Path, dict, bool]:
    """Build lmcache.cuda_ops for python's torch into cache_root/<key>/; (build dir, manifest, reused).

    A build for the same key is reused. Usage problems (no nvcc, another LMCache version, no GPU and
    no arch) raise UsageError; a failed build BuildError; either way nothing is left in cache_root."""
    env = dict(os.environ if env is None else env)
    sdist, cache_root = Path(sdist), Path(cache_root)
    if not sdist.is_file():
        raise UsageError(f"--sdist {sdist}: no such file")
    top, version = sdist_version(sdist)
    info = probe(python, env)
    if "problem" in info:
        raise UsageError(f"--python {python}: {info['problem']}")
    if not info.get("lmcache") or not info.get("torch"):
        raise UsageError(f"--python {python}: needs lmcache and torch installed (lmcache {info.get('lmcache')}, "
                         f"torch {info.get('torch') or info.get('torch_error')})")  # fmt: skip
    if version.split("+")[0] != info["lmcache"].split("+")[0]:
        raise UsageError(f"--sdist {sdist.name} is LMCache {version}; {python} has LMCache {info['lmcache']}")
    archs = [arch] if arch else info.get("arch") or []
    if not archs:
        raise UsageError(f"--python {python}: no GPU visible to tell the arch; give --arch (e.g. 9.0)")
    found = cached_build(cache_root, info["lmcache"], info["torch"], archs)
    if found is not None:
        return found[0], found[1], True
    nvcc = find_nvcc(env)
    if nvcc is None:
        raise UsageError(
            "no nvcc (not on PATH, nor in $CUDA_HOME/bin or /usr/local/cuda/bin): the CUDA toolkit builds the ops"
        )
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / build_key(info["lmcache"], info["torch"], archs)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=cache_root))
    try:
        failed_log = cache_root / f"{final.name}.failed.log"
        manifest = _build_in(tmp, failed_log, python, sdist, top, archs, nvcc, env, info, max_jobs)
        try:
            os.rename(tmp, final)  # atomic; fails if a concurrent build got there first
        except OSError:
            if cached_build(cache_root, info["lmcache"], info["torch"], archs) is None:
                raise
            return final, read_manifest(final), True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, manifest, False


def _build_in(tmp: Path, failed_log: Path, python, sdist: Path, top: str, archs, nvcc, env, info, max_jobs) -> dict:
    """Unpack, build in place, check the import, write the manifest: all inside tmp."""
    with tarfile.open(sdist) as tar:
        members = [
            m for m in tar.getmembers() if m.name.split("/")[0] == top and (m.isfile() or m.isdir() or m.issym())
        ]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    tree = tmp / top
    build_env = {
        **env,
        "PATH": os.pathsep.join([os.path.dirname(nvcc), env.get("PATH", "")]),
        "TORCH_CUDA_ARCH_LIST": ";".join(archs),
        "MAX_JOBS": str(max_jobs or max(1, (os.cpu_count() or 2) - 2)),
    }
    log = tmp / "build.log"
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        try:
            rc = subprocess.run(
                [python, "setup.py", "build_ext", "--inplace"], cwd=tree, env=build_env, stdout=fh,
                stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = "timeout"
    build_s = round(time.monotonic() - t0, 1)
    if rc != 0:
        tail = (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["no output"])[-1][:300]
        os.replace(log, failed_log)  # the log outlives the tree
        raise BuildError(f"building LMCache's ops failed (exit {rc}; log {failed_log}): {tail}")
    check = probe(python, with_pythonpath(env, tree), ops=True).get("ops") or {}
    ops_file = check.get("file") or ""
    if not check.get("imports") or not Path(ops_file).resolve().is_relative_to(tree.resolve()):
        raise BuildError(
            f"the build finished but {OPS_MODULE} does not import from it ({check.get('error') or ops_file})"
        )
    manifest = {
        "kind": MANIFEST_KIND,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "lmcache": info["lmcache"],
        "torch": info["torch"],
        "cuda": info.get("cuda"),
        "arch": arch_key(archs),
        "python": python,
        "sdist": {"name": sdist.name, "sha256": _sha256(sdist)},
        "nvcc": nvcc_version(nvcc),
        "source_dir": top,
        "ops_file": Path(ops_file).resolve().relative_to(tmp.resolve()).as_posix(),
        "build_s": build_s,
        "built_at": utc_now(),
    }
    write_json_atomic(tmp / MANIFEST_NAME, manifest)
    return manifest


# ---- python -m repro lmcache-ops -----------------------------------------------------------------


def main(argv: list[str]) -> int:
    from repro.commands import ArgumentParser  # repro.commands loads this module by name

    p = ArgumentParser(prog="python -m repro lmcache-ops", description="LMCache's compiled ops for the torch in use")
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build lmcache.cuda_ops from LMCache's sdist for PY's torch (cached)")
    b.add_argument("--python", default=sys.executable, metavar="PY")
    b.add_argument("--sdist", required=True, metavar="FILE")
    b.add_argument("--arch", default=None, help="CUDA arch, e.g. 9.0 (default: the visible GPUs')")
    b.add_argument("--cache", default=str(CACHE_ROOT), metavar="DIR")
    s = sub.add_parser("show", help="which copy path an arm run with PY would get (--lmcache-ops auto)")
    s.add_argument("--python", default=sys.executable, metavar="PY")
    s.add_argument("--cache", default=str(CACHE_ROOT), metavar="DIR")
    args = p.parse_args(argv)
    if getattr(args, "arch", None) is not None and not re.fullmatch(r"\d+\.\d+", args.arch):
        raise UsageError(f"--arch {args.arch}: a compute capability like 9.0")
    if args.action == "show":
        sys.stdout.write(dumps_json(resolve("auto", args.python, dict(os.environ), args.cache).provenance))
        return EXIT_OK
    try:
        build_dir, manifest, reused = build(args.python, args.sdist, args.cache, args.arch)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    word = "reused" if reused else f"built in {manifest['build_s']} s"
    print(f"{build_dir} ({word}): PYTHONPATH={source_path(build_dir, manifest)}")
    return EXIT_OK
