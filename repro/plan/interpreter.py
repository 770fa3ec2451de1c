"""What an interpreter holds, asked in a subprocess (it is never imported here): the engine interpreter's
Python and stacks (--python: checked before the run, recorded in its provenance), and any probe that prints
one JSON object (repro.lmcache.ops's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

# Asked of an engine interpreter without importing vLLM (seconds, not the 20 s an import takes):
# where it is, its Python, and the versions and importability of the stacks the engine needs.
_ENGINE_PROBE = r"""
import importlib.metadata as m, importlib.util as u, json, platform, sys
def version(name):
    for dist in (name, name + "-cpu"):
        try:
            return m.version(dist)
        except m.PackageNotFoundError:
            pass
    return None
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "python": platform.python_version(),
    "packages": {n: version(n) for n in ("vllm", "lmcache", "torch", "transformers")},
    "importable": {n: u.find_spec(n) is not None for n in ("vllm", "lmcache")},
}))
"""
ENGINE_PROBE_TIMEOUT_S = 60


def probe_python(python: str) -> dict:
    """What an engine interpreter holds (never raises): its Python, package versions and whether vllm and
    lmcache are importable; {"problem": "<one line>"} when it cannot be asked."""
    found = python if os.sep in python else shutil.which(python)
    if not found or not os.path.exists(found):
        return {"problem": "no such file"}
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        return {"problem": "not an executable file"}
    return ask_json([found, "-c", _ENGINE_PROBE], ENGINE_PROBE_TIMEOUT_S, "is not a working Python 3")


def ask_json(argv: list[str], timeout_s: float, unanswered: str, env: dict | None = None, who: str = "") -> dict:
    """Run a probe that prints one JSON object on its last line; {"problem": "<one line>"} when it
    cannot run, times out or answers anything else. Never raises."""
    who = f"{who} " if who else ""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    except OSError as exc:
        return {"problem": f"cannot run {who or 'it '}({exc.strerror or exc})"}
    except subprocess.TimeoutExpired:
        return {"problem": f"{who}did not answer within {timeout_s:g} s"}
    lines = out.stdout.strip().splitlines()
    try:
        info = json.loads(lines[-1]) if out.returncode == 0 and lines else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"problem": f"{who}{unanswered} (exit {out.returncode}: {tail})"}
    return info
