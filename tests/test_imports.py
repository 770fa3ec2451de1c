"""Modules outside the engine's own must never import vllm, torch or lmcache."""

import json
import pkgutil
import subprocess
import sys

from kvkit_testutil import ROOT

import repro

ENGINE_SIDE = {"repro.engine", "repro.margins", "repro.engine.preflight", "repro.engine.connectors.planted_fault"}


def _modules():
    names = ["repro"]
    for info in pkgutil.walk_packages(repro.__path__, "repro."):
        names.append(info.name)
    return sorted(n for n in names if n not in ENGINE_SIDE and n != "repro.__main__")


def test_light_modules_never_import_heavy_stacks():
    mods = _modules()
    assert "repro.verify" in mods and "repro.runner" in mods and "repro.report" in mods
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in ('vllm', 'torch', 'lmcache'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
