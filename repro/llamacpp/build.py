"""llama-cpp-python built once per machine, portable, from its hash-checked source distribution. Standard library
only: tasks.py calls it before any environment exists.

Why the kit keeps its own wheel cache rather than pip's, and builds with --no-cache-dir: pip keys a built wheel on the
sdist alone, not on the CMAKE_ARGS it was built with, so a native build cached by an earlier `pip install` would be
handed to a portable request (a fresh clone's first build here took pip's cached wheel in 0.6 s until this flag). The default native build dies with SIGILL on machines that advertise AMX but cannot use its tile state (this
kit's CI VMs: docs/llamacpp.md), and a wheel built on one CI machine runs on the next only if it is portable. So the
cache key is the pinned version, the sdist's SHA-256, the flags, the architecture and the Python tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.paths import KIT_ROOT

SDIST_REQUIREMENT = "requirements/llamacpp.txt"
DEPS_REQUIREMENT = "requirements/llamacpp-deps.txt"
PACKAGE = "llama-cpp-python"
# Portable: no -march=native (no AMX path), AVX2/FMA/F16C on (every x86-64 CPU the kit runs on has them); no
# multimodal library (the kit sends no images to llama.cpp; it halves the build).
CMAKE_ARGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAVA_BUILD=OFF")
CACHE_ENV = "KVKIT_WHEEL_CACHE"
BUILD_RECORD = "build.json"
# in an environment the kit made: the build record of the wheel installed there (tasks.py writes it,
# repro.llamacpp.engine puts it in every report's engine versions)
BUILD_STAMP = ".kvkit-llamacpp-wheel"
_PIN = re.compile(r"^llama-cpp-python==(?P<version>\S+)\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})\s*$")


def pin(root: Path = KIT_ROOT) -> tuple[str, str]:
    """(version, sdist SHA-256) from requirements/llamacpp.txt, the one place they are written."""
    for line in (root / SDIST_REQUIREMENT).read_text(encoding="utf-8").splitlines():
        if m := _PIN.match(line.strip()):
            return m["version"], m["sha256"]
    raise ValueError(f"{SDIST_REQUIREMENT}: no `llama-cpp-python==VERSION --hash=sha256:...` line")


def cache_dir(environ=os.environ) -> Path:
    """Per machine, not per clone: $KVKIT_WHEEL_CACHE, else $XDG_CACHE_HOME/kvkit/wheels, else ~/.cache/kvkit/wheels."""
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvkit" / "wheels"


def cache_key(version: str, sha256: str, python_tag: str | None = None, machine: str | None = None) -> str:
    tag = python_tag or f"cp{sys.version_info.major}{sys.version_info.minor}"
    parts = [PACKAGE, version, sha256, *CMAKE_ARGS, machine or platform.machine(), tag]
    return f"{PACKAGE}-{version}-{hashlib.sha256(' '.join(parts).encode()).hexdigest()[:16]}"


def cached_wheel(folder: Path) -> Path | None:
    """The wheel a finished build left in its key's folder (a build that died leaves no folder: it renames last)."""
    wheels = sorted(folder.glob("*.whl")) if (folder / BUILD_RECORD).is_file() else []
    return wheels[0] if len(wheels) == 1 else None


def ensure_wheel(python: str, log, root: Path = KIT_ROOT, environ=os.environ) -> tuple[Path, dict]:
    """The portable wheel for this machine: from the cache, else built now by `python -m pip wheel` (pip checks the
    sdist's hash; its output to `log`, an open file) and kept. Returns the wheel and its build record (the time it
    took, the flags, the machine); subprocess.CalledProcessError where the build fails."""
    version, sha256 = pin(root)
    tag = subprocess.run(
        [python, "-c", "import sys; print(f'cp{sys.version_info.major}{sys.version_info.minor}')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    folder = cache_dir(environ) / cache_key(version, sha256, tag)
    if cached_wheel(folder) is not None:
        return finished_build(folder, cached_wheel)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    env = {**environ, "CMAKE_ARGS": " ".join(CMAKE_ARGS), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
    started = time.time()
    try:
        subprocess.run(
            [python, "-m", "pip", "wheel", "--no-deps", "--require-hashes", "--no-binary", PACKAGE, "--no-cache-dir",
             "--disable-pip-version-check", "-w", str(tmp), "-r", str(root / SDIST_REQUIREMENT)],
            check=True, stdout=log, stderr=log, env=env,
        )  # fmt: skip
        (wheel,) = tmp.glob("*.whl")
        record = {
            "package": PACKAGE,
            "version": version,
            "sdist_sha256": sha256,
            "cmake_args": list(CMAKE_ARGS),
            "python": tag,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "build_s": round(time.time() - started, 1),
            "wheel": wheel.name,
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        }
        publish(tmp, folder, record, cached_wheel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finished_build(folder, cached_wheel)


def finished_build(folder: Path, finished) -> tuple[Path, dict]:
    """What a finished build under its key holds (finished(folder): its wheel or binary) and its build record."""
    built = finished(folder)
    assert built is not None
    return built, json.loads((folder / BUILD_RECORD).read_text(encoding="utf-8"))


def publish(tmp: Path, folder: Path, record: dict, finished) -> None:
    """A finished build's folder renamed to its key, its record in it: renamed last, so that a folder under the key is
    a finished build. Where another build of the same key finished first, that one is used (finished(folder) says)."""
    (tmp / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    try:
        tmp.rename(folder)
    except OSError:
        if finished(folder) is None:
            raise


# llama-server: built from the same hash-checked sdist (its vendored llama.cpp, tools/server/ included), with the
# wheel's portable flags, statically linked, the server target alone; no web UI download (LLAMA_USE_PREBUILT_UI
# off), no HTTPS (the kit talks to it on loopback).
SERVER = "llama-server"
SERVER_STAMP = ".kvkit-llama-server"  # in the llama.cpp environment: the build record of the llama-server in its bin/
SERVER_CMAKE_ARGS = (*(a for a in CMAKE_ARGS if not a.startswith("-DLLAVA")), "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
                     "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
                     "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")  # fmt: skip


def server_key(version: str, sha256: str, machine: str | None = None) -> str:
    parts = [SERVER, version, sha256, *SERVER_CMAKE_ARGS, machine or platform.machine()]
    return f"{SERVER}-{version}-{hashlib.sha256(' '.join(parts).encode()).hexdigest()[:16]}"


def cached_server(folder: Path) -> Path | None:
    binary = folder / SERVER
    return binary if (folder / BUILD_RECORD).is_file() and binary.is_file() else None


def ensure_server(python: str, log, root: Path = KIT_ROOT, environ=os.environ) -> tuple[Path, dict]:
    """The portable llama-server for this machine: from the cache, else built now from the pinned sdist (pip
    downloads it, hash-checked; cmake and ninja build the target) and kept. Returns the binary and its build record;
    subprocess.CalledProcessError where a step fails (its output in `log`)."""
    version, sha256 = pin(root)
    folder = cache_dir(environ) / server_key(version, sha256)
    if cached_server(folder) is not None:
        return finished_build(folder, cached_server)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-server-", dir=folder.parent))
    jobs = str(os.cpu_count() or 1)
    started = time.time()
    try:

        def run(argv: list[str]) -> None:
            subprocess.run(argv, check=True, stdout=log, stderr=log)

        run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
                        "--no-cache-dir", "--disable-pip-version-check", "-d", str(tmp / "sdist"),
                        "-r", str(root / SDIST_REQUIREMENT)])  # fmt: skip
        (sdist,) = (tmp / "sdist").glob("*.tar.gz")
        shutil.unpack_archive(sdist, tmp / "src", filter="data")
        (source,) = (tmp / "src").glob("*/vendor/llama.cpp")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        run(["cmake", "-S", str(source), "-B", str(tmp / "build"), *generator, *SERVER_CMAKE_ARGS])
        run(["cmake", "--build", str(tmp / "build"), "--target", SERVER, "-j", jobs])
        shutil.copy2(tmp / "build" / "bin" / SERVER, tmp / SERVER)
        record = {
            "package": SERVER,
            "from": f"{PACKAGE} {version} sdist (sha256 {sha256}), vendor/llama.cpp",
            "cmake_args": list(SERVER_CMAKE_ARGS),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "build_s": round(time.time() - started, 1),
            "binary_sha256": hashlib.sha256((tmp / SERVER).read_bytes()).hexdigest(),
        }
        for leftover in ("sdist", "src", "build"):
            shutil.rmtree(tmp / leftover, ignore_errors=True)
        publish(tmp, folder, record, cached_server)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finished_build(folder, cached_server)
