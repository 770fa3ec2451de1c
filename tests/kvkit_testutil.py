"""Test helpers shared by tests/ and tests/gpu/ (imported by name: a conftest cannot be)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARTIFACTS = ROOT / "tests" / "artifacts"


def committed_or_skip(*paths: Path) -> None:
    """Skip where these committed files are left out by design: an unpacked kit (no .git) carries its chosen
    reports under evidence/, never reports/. In a checkout a missing file is not skipped: the test fails on it."""
    missing = [p.relative_to(ROOT).as_posix() for p in paths if not p.exists()]
    if missing and not (ROOT / ".git").exists():
        import pytest

        pytest.skip(f"{', '.join(missing)}: not part of this copy (the kit)")


def run_cli(args: list[str], timeout: float = 1500, env: dict | None = None) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ, PYTHONPATH=pythonpath)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "repro.verify_kv_reuse", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


# The newest CPU vLLM's environment (tasks.py NEWEST_CPU_PROFILE; make test builds it; tests/test_profiles.py pins the
# name to tasks.py's)
NEWEST_CPU_ENV = ROOT / ".venvs" / "cpu-vllm-0.32"


def newest_cpu_python() -> str | None:
    """The newest CPU vLLM's interpreter (.venvs/cpu-vllm-0.32), None where it was not built (make test builds it)."""
    py = NEWEST_CPU_ENV / "bin" / "python"
    return str(py) if py.exists() else None


def need_newest_cpu_python() -> str:
    """newest_cpu_python(), or the test fails where make test should have built it; only a bare pytest skips."""
    py = newest_cpu_python()
    if py is None:
        import pytest

        if os.environ.get("KVKIT_MAKE_TEST"):
            pytest.fail(f"{NEWEST_CPU_ENV.relative_to(ROOT)} is missing, though make test builds it")
        pytest.skip(
            f"{NEWEST_CPU_ENV.relative_to(ROOT)} not built (make test builds it; or make repro PROFILE=cpu-vllm-0.32)"
        )
    return py


# llama.cpp's environment (tasks.py LLAMACPP_ENV; make test-extended and make repro ENGINE=llamacpp build it)
LLAMACPP_ENV = ROOT / ".venvs" / "llamacpp"


def need_llamacpp_python() -> str:
    """.venvs/llamacpp's interpreter, or the test fails where make test-extended should have built it; only a bare
    pytest skips."""
    py = LLAMACPP_ENV / "bin" / "python"
    from repro.llamacpp.build import BUILD_STAMP

    if not (LLAMACPP_ENV / BUILD_STAMP).is_file():
        import pytest

        if os.environ.get("KVKIT_MAKE_TEST"):
            pytest.fail(f"{LLAMACPP_ENV.relative_to(ROOT)} is missing, though make test-extended builds it")
        pytest.skip(f"{LLAMACPP_ENV.relative_to(ROOT)} not built (make repro ENGINE=llamacpp builds it)")
    return str(py)


def engine_block_size(python: str | None = None) -> int:
    """The block size the CPU self-test's --block-size auto picks for this interpreter's vLLM (asked of its attention
    backend once per install: repro.plan.interpreter.probe_engine): what the tests' block arithmetic is in."""
    from repro.plan.block_size import choose_block_size
    from repro.plan.interpreter import probe_engine

    caps = probe_engine(python or sys.executable, "cpu")
    if "problem" in caps:
        raise RuntimeError(f"{python or sys.executable}: {caps['problem']}")
    size = choose_block_size(caps["block_sizes"])
    if size is None:
        raise RuntimeError(f"{python or sys.executable}: its CPU attention backend names no block size")
    return size


def have_vllm() -> bool:
    from importlib.util import find_spec

    return find_spec("vllm") is not None


def run_test_connector(model: str, name: str, extra_config: dict, report: Path) -> subprocess.CompletedProcess:
    """The CPU engine with one of tests/connectors/ (module = file name) loaded by module path, on
    the self-test fixture's first probe, cold + 2 reuses: how a user's own connector is run."""
    import json

    from repro.plan.options import CPU_ENGINE_FLAGS

    module = {"NoisyReloadConnector": "noisy_connector", "ScaledBlockConnector": "subtle_connector"}[name]
    argv = ["--model", model, *CPU_ENGINE_FLAGS, "--kv-connector", name, "--kv-connector-module-path", module,
            "--kv-connector-extra-config", json.dumps(extra_config), "--fixture", "fixtures/selftest-cpu.json",
            "--reuses", "2", "--report", str(report)]  # fmt: skip
    return run_cli(
        argv,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'connectors'}"},
    )


# The CPU self-test's arm verdicts (fixtures/selftest-cpu.json), on any machine and under any kernel variant.
SELFTEST_VERDICTS = {
    "baseline": "PASS",
    "ExampleConnector": "PASS",
    "PlantedFault": "FAIL",
    "PlantedFault-none": "PASS",
    "native": "PASS",
    "native-matched": "PASS",
}


@contextmanager
def serving(handler, on_exit=None):
    """A loopback HTTP server (a stand-in) with this request handler class, its URL yielded; on_exit runs before it
    stops (to release a handler that waits)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        if on_exit is not None:
            on_exit()
        server.shutdown()
        server.server_close()
