"""The kit's planted connector as one module that travels beside repro_min.py: vLLM imports a connector by module
path in its engine processes, and without the kit on the path `repro.engine.connectors.planted_fault` is not there
(nor the planted_gates and planted_failures it imports). The module is made from the kit's own files, never from a
report."""

from __future__ import annotations

import ast
from collections.abc import Callable

from repro import __version__
from repro.errors import UsageError
from repro.paths import KIT_ROOT
from repro.plan.arms import PLANTED_FAULT_MODULE

PLANTED_GATES_MODULE = "repro.engine.connectors.planted_gates"
PLANTED_FAILURES_MODULE = "repro.engine.connectors.planted_failures"
PLANTED_HELPERS = (PLANTED_GATES_MODULE, PLANTED_FAILURES_MODULE)  # the kit modules planted_fault imports, in order
SHIPPED_MODULE = "planted_fault_connector"  # the three as one module: its name in repro_min.json, its file beside it
# The module paths a report names the planted connector by: today's, and where the kit kept it before repro/engine/
PLANTED_MODULES = (PLANTED_FAULT_MODULE, "repro.connectors.planted_fault")


def _split_lines(source: str, drop: Callable[[int, ast.stmt], bool]) -> tuple[str, str]:
    """(source without the top-level statements drop picks by (index, node), the lines of those it picked)."""
    lines = source.splitlines(keepends=True)
    body = ast.parse(source).body
    gone = {i for n, node in enumerate(body) if drop(n, node) for i in range(node.lineno - 1, node.end_lineno or 0)}
    return "".join(x for i, x in enumerate(lines) if i not in gone), "".join(lines[i] for i in sorted(gone))


def _is_import_of(node: ast.stmt, *modules: str) -> bool:
    return isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules


def _is_docstring(n: int, node: ast.stmt) -> bool:
    return n == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _kit_imports(tree: ast.Module) -> list[str]:
    """The modules of the kit (repro, or a relative import) that a module imports anywhere."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.split(".")[0] == "repro"]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "repro"):
            names.append("." * node.level + (node.module or ""))
    return names


def _read(module: str) -> str:
    return (KIT_ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")


def planted_connector_source() -> str:
    """The kit's planted connector as one module of vLLM, torch and the standard library, from the kit's own files
    (never a report's): planted_fault.py's docstring, then planted_gates.py and planted_failures.py, then
    planted_fault.py, without the imports of the helpers by it and their `from __future__` lines but one. Its connector
    behaves as the kit's: the modules share no top-level name but the same imports
    (tests/test_repro_min_connector.py)."""
    helpers = [_split_lines(_read(m), lambda n, node: _is_import_of(node, "__future__"))[0] for m in PLANTED_HELPERS]
    fault, doc = _split_lines(_read(PLANTED_FAULT_MODULE), _is_docstring)  # it leads the one module
    fault, _ = _split_lines(fault, lambda n, node: _is_import_of(node, "__future__", *PLANTED_HELPERS))
    head = (
        f"# Written by kvkit {__version__} beside repro_min.py: its {PLANTED_FAULT_MODULE} and the\n"
        f"# {' and '.join(PLANTED_HELPERS)} it imports, as one module that needs vLLM and torch only.\n"
    )
    parts = "".join(f"# ---- {m}\n{text}\n" for m, text in zip(PLANTED_HELPERS, helpers))
    source = f"{head}{doc}\nfrom __future__ import annotations\n\n{parts}# ---- {PLANTED_FAULT_MODULE}\n{fault}"
    if left := _kit_imports(ast.parse(source)):  # the kit's files changed: a module of theirs would not travel
        raise RuntimeError(f"{SHIPPED_MODULE}: the planted connector still imports {left[0]} of the kit")
    return source


def planted_connector(class_name: str) -> str:
    """planted_connector_source, for an arm whose connector class is class_name; UsageError, one line, where the
    module has no such class (vLLM would fail to find it, and the script give no verdict)."""
    source = planted_connector_source()
    if class_name not in {n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}:
        shown = class_name if class_name.isprintable() and len(class_name) <= 100 else repr(class_name)[:100]
        raise UsageError(f"repro_min.py: the kit's planted connector module has no class {shown}")
    return source
