"""--lmcache-ops fallback: block LMCache's compiled ops in every process of the arm, so LMCache runs its torch fallback.

This folder goes first on the arm's PYTHONPATH (repro.lmcache.ops.resolve); Python's `site` then
runs this file at start-up in the engine child, its workers and the LMCache MP server alike. LMCache
0.5.4 imports its compiled ops in one place per device, `lmcache.cuda_ops` for CUDA and ROCm
(`v1/platform/cuda/device_ops.py:32`) and `lmcache.xpu_ops` for XPU (`v1/platform/xpu/device_ops.py:32`),
and catches ImportError there: it logs "lmcache.cuda_ops compiled extension not found" and keeps the
torch baseline. The finder below raises that ImportError. `lmcache.lmcache_native` is not blocked:
LMCache imports it unconditionally and cannot run without it. A sitecustomize further on sys.path
(the environment's own) still runs after this one.
"""

import importlib.machinery
import importlib.util
import os
import sys

BLOCKED = ("lmcache.cuda_ops", "lmcache.xpu_ops")
MESSAGE = "{name} blocked by the kit (--lmcache-ops fallback)"


class LMCacheOpsBlocker:
    """A sys.meta_path finder that refuses LMCache's compiled ops modules."""

    kvkit_lmcache_ops_blocker = True  # found by name: this file may be loaded twice, as two classes

    def find_spec(self, fullname, path=None, target=None):
        if fullname in BLOCKED:
            raise ImportError(MESSAGE.format(name=fullname), name=fullname)


def _chain() -> None:
    """Run the next sitecustomize on sys.path (after this folder), as Python would have without us."""
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    rest = sys.path[entries.index(here) + 1 :] if here in entries else [p for p in sys.path if p]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in rest if os.path.abspath(p) != here])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if not any(getattr(f, "kvkit_lmcache_ops_blocker", False) for f in sys.meta_path):
    sys.meta_path.insert(0, LMCacheOpsBlocker())
    _chain()
