"""The engine boundary: only repro.engine imports vllm, torch or lmcache, and only repro.judge.verdict writes a verdict.

Every module of the package is found by walking the source tree (no hand-kept list) and read as
a syntax tree, so an import inside a function counts as much as one at the top of the module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from kvkit_testutil import ROOT

HEAVY = ("vllm", "torch", "lmcache")
ENGINE = "repro.engine"
# llama.cpp's child (repro.llamacpp) is the only place llama_cpp is imported, and it imports none of HEAVY: its
# environment (.venvs/llamacpp) has no vLLM and no torch
LLAMACPP = "repro.llamacpp"
# What the engine child may take from the parent's side: the contract and leaf helpers, never
# the parent's machinery (the runner, the verifier, the planner, the command line).
PARENT_ONLY = (
    "repro.run.runner",
    "repro.verify",
    "repro.plan.arms",
    "repro.plan.options",
    "repro.commands",
    "repro.record.report",
    "repro.record.acceptance",
    "repro.record.exit_rule",
)
VERDICT_NAMES = {
    "PASS", "FAIL", "INCONCLUSIVE", "ERROR", "SKIPPED", "EXACT", "NUMERIC", "MISPLACED", "FOREIGN", "CORRUPT", "UNAVAILABLE"
}  # fmt: skip
# The same words that are not verdicts: logscan reads log levels (WARNING, ERROR, CRITICAL).
NOT_VERDICTS = {"repro.judge.logscan": {"ERROR"}}


def package_modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted((ROOT / "repro").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return out


def imported(tree: ast.Module, module: str) -> set[str]:
    """Every module name an import statement anywhere in the tree names (relative imports resolved)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def is_engine(module: str) -> bool:
    return module == ENGINE or module.startswith(ENGINE + ".")


def test_the_scan_sees_every_module_and_every_kind_of_import():
    modules = package_modules()
    assert {
        "repro.verify",
        "repro.contract",
        "repro.judge.verdict",
        "repro.engine.child",
        "repro.kit.archive",
        "repro.detection.run",
        "repro.publish.site",
        "repro.engine.connectors.planted_fault",
    } <= set(modules)
    inside_a_function = ast.parse("def f():\n    from vllm import LLM\n    import torch.nn as nn\n")
    assert {"vllm", "torch.nn"} <= imported(inside_a_function, "repro.x")
    assert "repro.engine.child" in imported(ast.parse("from .child import main"), "repro.engine.__main__")


def test_nothing_outside_the_engine_package_imports_a_heavy_stack():
    offenders = {
        module: sorted(n for n in imported(tree, module) if n.split(".")[0] in HEAVY)
        for module, tree in package_modules().items()
        if not is_engine(module)
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_only_llamacpps_child_imports_llama_cpp_and_it_imports_no_heavy_stack():
    def home(module: str) -> bool:
        return module == LLAMACPP or module.startswith(LLAMACPP + ".")

    offenders = {}
    for module, tree in package_modules().items():
        names = imported(tree, module)
        bad = [n for n in names if n.split(".")[0] == "llama_cpp"] if not home(module) else []
        bad += [n for n in names if n.split(".")[0] in HEAVY] if home(module) else []
        bad += [n for n in names if n.startswith(PARENT_ONLY) or is_engine(n)] if home(module) else []
        if bad:
            offenders[module] = sorted(bad)
    assert offenders == {}


def test_the_engine_child_does_not_reach_into_the_parent_side():
    offenders = {
        module: sorted(n for n in imported(tree, module) if n.startswith(PARENT_ONLY))
        for module, tree in package_modules().items()
        if is_engine(module)
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_light_modules_import_without_a_heavy_stack_in_a_fresh_interpreter():
    mods = sorted(m for m in package_modules() if not is_engine(m) and not m.endswith("__main__"))
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in ('vllm', 'torch', 'lmcache'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_only_the_verdict_module_writes_a_verdict():
    """Verdict names are imported from repro.judge.verdict everywhere else (docstrings and longer text aside)."""
    offenders = {}
    for module, tree in package_modules().items():
        if module == "repro.judge.verdict":
            continue
        found = sorted(
            f"line {node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and node.value in VERDICT_NAMES
            and node.value not in NOT_VERDICTS.get(module, ())
        )
        if found:
            offenders[module] = found
    assert offenders == {}
