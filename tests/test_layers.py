"""The package's floors: a module imports only from its own floor or below, and no two modules import
each other, however indirectly. Imports inside functions count (a deferred import is still a dependency).

The floors, lowest first. A module's floor is that of the longest name in FLOORS that is the module or a
package above it; a module on no floor fails the test: give it one.

  base       leaves every other floor uses: the version, errors and exit codes, paths, the one file
             writer, the parent<->child contract, token comparison, log scanning, the lifeline, the
             progress display, prompts, replays, device sharing, the devices a run may use, the
             command registry (it loads commands by name, never by import)
  core       pure decisions and the inputs they read: verdicts and their wording, trials, fixtures,
             suites, judging an arm, the report file (schema, loading, exit codes), models and
             provenance, a matrix file and its cells
  engine     the child side (repro.engine, and llama.cpp's repro.llamacpp): the only floor that imports vLLM,
             torch, LMCache or llama.cpp (tests/test_imports.py), above what it shares with the parent
  options    the verifier's command line: its flags checked into Options
  machinery  the parent side of a run: planning the arms, scheduling them, running children and MP
             servers, their work directory, the load neighbours, the KV audit; the detection study's plan
  read       reports read back: the read model (repro.readmodel), a matrix's cell states, the detection
             study's blame and matrix
  publish    what reports become: the text summary, pages, issue Markdown (repro.publish), and the
             matrix and detection pages
  commands   whole commands: the verifier's orchestration and entry point, bench, margins, the matrix on
             Ray, the detection study's runs, the kit, the chaos run, model conversion and checks

`from repro.pkg import module` is an import of that module, not of the package's __init__ (a docstring).

The rooms (the folders of repro/) are in an order too, ROOM_ORDER, lowest first: an import from one room into
another goes down that order, but for the few named in KNOWN_ROOM_UPWARD (module by module, each with why).
docs/layout.md states the same order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_imports import package_modules

# Each floor and the names on it, lowest first; a line that starts with spaces goes on with the floor above.
FLOOR_TABLE = """
base       repro repro.errors repro.paths repro.record.atomic repro.record.child_io repro.contract repro.judge.compare repro.judge.logscan repro.run.lifeline
           repro.run.progress repro.plan.prompts repro.judge.replays repro.run.sharing repro.plan.devices repro.commands
           repro.judge.answer
           repro.plan.settings repro.plan.interpreter repro.run.exits repro.lmcache.mp_ports repro.plan.block_size
           repro.plan.report_path repro.plan.llamacpp repro.llamacpp.build
core       repro.judge.verdict repro.judge.wording repro.judge.trials repro.plan.fixtures repro.plan.suite repro.judge.evaluate repro.record.report
           repro.models repro.models.tiny repro.models.sliding repro.models.hybrid repro.record.provenance repro.matrix.spec
           repro.matrix.cell
           repro.judge.kv_verdict repro.judge.kv_shape repro.judge.scenario_verdict repro.judge.batch_invariance repro.judge.expectations
           repro.record.acceptance repro.record.exit_rule repro.judge.kv_grid repro.record.compact
           repro.plan.scenarios repro.record.publish repro.judge.members repro.plan.adapters repro.judge.adapters
           repro.plan.load repro.plan.prompt_logprobs repro.judge.prompt_logprobs repro.plan.endpoint repro.plan.images
           repro.judge.pd_verdict repro.judge.pd_kvaudit repro.disagg repro.disagg.cases repro.judge.upstream repro.plan.upstream
           repro.plan.fixture_keys repro.plan.salts repro.judge.salts repro.plan.speculative
engine     repro.engine repro.llamacpp
options    repro.plan.options
machinery  repro.plan.arms repro.run.scheduler repro.run.runner repro.run.warm repro.run.workdir repro.lmcache.ops repro.lmcache.mp
           repro.lmcache.signals repro.run.neighbour repro.run.gpu_load repro.run.cpu_load repro.judge.kvaudit repro.run.scenarios
           repro.detection.plan repro.detection.catalogue
           repro.plan.run_plan repro.run.clock repro.run.launch repro.run.arm_runs repro.run.kvaudit repro.run.workspace
           repro.run.scenario_runs repro.run.entries repro.run.confirm repro.record.assemble repro.run.load_scenario
           repro.run.scenario_kv
           repro.disagg.pair repro.disagg.servers repro.disagg.report repro.disagg.audit
           repro.plan.expectation_names
read       repro.readmodel repro.matrix.status repro.detection.blame repro.detection.matrix repro.detection.expected
           repro.detection.scenario_cells
publish    repro.publish repro.matrix.page repro.detection.page repro.detection.scenario_page repro.disagg.page
commands   repro.verify repro.verify_kv_reuse repro.__main__ repro.measure.bench repro.measure.margins repro.matrix
           repro.measure.load_bench
           repro.detection repro.detection.scenario_plan repro.detection.load_column repro.kit repro.chaos repro.models.convert
           repro.models.check repro.disagg.commands repro.watch
"""


# The rooms, lowest first. "ground" is repro/'s own modules below every room (the package, errors, paths, the
# command registry); "entry" is the verifier's pipeline and entry points (repro/verify.py and the two mains).
ROOM_ORDER = (
    "ground", "contract", "judge", "plan", "record", "lmcache", "run", "models", "engine", "llamacpp", "readmodel",
    "publish",
    "detection", "matrix", "measure", "disagg", "kit", "chaos", "watch", "entry",
)  # fmt: skip
GROUND = {"repro", "repro.errors", "repro.paths", "repro.commands"}
ENTRY = {"repro.verify", "repro.verify_kv_reuse", "repro.__main__"}
# Imports that go up the room order, each with why. An entry that no longer matches an import fails the test.
KNOWN_ROOM_UPWARD = {
    # what an engine interpreter offers is asked once per vLLM install and kept: written by the one writer
    ("repro.plan.interpreter", "repro.record.atomic"): "the engine probe's answer is kept by the one writer",
    # a report's provenance names its model: the registry's entry and the tiny model's digest
    ("repro.record.provenance", "repro.models.registry"): "provenance names the model",
    ("repro.record.provenance", "repro.models.tiny"): "provenance names the model",
    # the LMCache MP server is a child of the kit like an arm: started, watched and stopped by the runner's
    # machinery, its ports checked against its own process group
    ("repro.lmcache.mp", "repro.run.runner"): "the MP server is a child the runner starts",
    ("repro.lmcache.mp_ports", "repro.run.lifeline"): "the MP server's process group",
    # the site lists every page: the matrix and detection pages, which render with publish's templates
    ("repro.publish.catalog", "repro.detection.page"): "the site lists the study's pages",
    ("repro.publish.catalog", "repro.detection.plan"): "the site lists the study's pages",
    ("repro.publish.catalog", "repro.detection.scenario_cells"): "the site lists the study's pages",
    ("repro.publish.catalog", "repro.detection.scenario_page"): "the site lists the study's pages",
    ("repro.publish.catalog", "repro.matrix.page"): "the site lists the matrix pages",
    ("repro.publish.catalog", "repro.disagg.page"): "the site lists the P→D pages",
    ("repro.publish.catalog", "repro.disagg.report"): "the site lists the P→D pages",
}


def room_of(module: str) -> str:
    if module in GROUND:
        return "ground"
    if module in ENTRY:
        return "entry"
    return module.split(".")[1]


def parse_floors(table: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    floors: list[tuple[str, list[str]]] = []
    for line in table.strip("\n").splitlines():
        if line.startswith(" "):
            floors[-1][1].extend(line.split())
        else:
            floor, *names = line.split()
            floors.append((floor, names))
    return tuple((floor, tuple(names)) for floor, names in floors)


FLOORS = parse_floors(FLOOR_TABLE)
# Known imports from a lower floor to a higher one, each with why it is still there and what removes it.
# An entry that no longer matches an import fails the test: take it out.
KNOWN_UPWARD = {}
NAMES = {name: floor for floor, (_, names) in enumerate(FLOORS) for name in names}


def floor_of(module: str) -> int | None:
    """The floor of the longest name in FLOORS that is the module or a package above it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if (name := ".".join(parts[:n])) in NAMES:
            return NAMES[name]
    return None


def _resolve(name: str, modules) -> str:
    """The package's module a dotted name is, or is an attribute of ('' for none)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports_of(tree: ast.Module, module: str, modules) -> set[str]:
    """The package's modules that the import statements anywhere in the tree name (relative ones resolved)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {_resolve(a.name, modules) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # as tests/test_imports.py resolves them (the package has none today)
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                names.add(sub if sub in modules else _resolve(base, modules))
    return {n for n in names if n.startswith("repro") and n != module}


def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = package_modules()
    return {module: imports_of(tree, module, modules) for module, tree in modules.items()}


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_every_module_of_the_package_is_on_a_floor():
    names = [name for _, on_floor in FLOORS for name in on_floor]
    assert len(names) == len(set(names)), "a name on two floors"
    assert sorted(m for m in package_modules() if floor_of(m) is None) == []
    assert floor_of("repro.models.gguf") == NAMES["repro.models"]  # the longest name decides
    assert floor_of("repro.models.check") == NAMES["repro.verify"]
    assert floor_of("repro.publish.site") == NAMES["repro.publish"]


def test_no_module_imports_from_a_floor_above_its_own():
    g = graph()
    upward = sorted(
        (m, d) for m, deps in g.items() for d in deps if (floor_of(d) or 0) > (floor_of(m) or 0)
    )  # fmt: skip
    named = [f"{m} ({FLOORS[floor_of(m)][0]}) imports {d} ({FLOORS[floor_of(d)][0]})" for m, d in upward]
    assert [x for x, (m, d) in zip(named, upward) if (m, d) not in KNOWN_UPWARD] == []
    stale = sorted(set(KNOWN_UPWARD) - set(upward))
    assert stale == [], "these known upward imports are gone: take them out of KNOWN_UPWARD"


def test_no_import_cycle():
    """Issue 22 (2): repro.plan.options and repro.plan.arms imported each other (Options and DEFAULT_ENGINE_MODULE one
    way, uses_cuda the other, deferred into a function); the devices now sit below both."""
    g = graph()
    for m, d in KNOWN_UPWARD:  # a known upward import closes a cycle of its own: it goes with it
        g[m].discard(d)
    assert _cycles(g) == []


def test_every_module_is_in_a_room_of_the_order():
    assert sorted({room_of(m) for m in package_modules()} - set(ROOM_ORDER)) == []
    assert sorted(set(ROOM_ORDER) - {room_of(m) for m in package_modules()}) == []


def test_imports_between_rooms_go_down_the_room_order():
    """Issue 34: the rooms read in order. Before, run and lmcache, judge and run, judge and plan imported each
    other; run/confirm.py and run/entries.py (judging runs as they finish) moved into run, logscan into judge and
    shared_first_blocks into judge/evaluate.py, and judge now imports only the contract."""
    rank = {room: i for i, room in enumerate(ROOM_ORDER)}
    upward = sorted(
        (m, d) for m, deps in graph().items() for d in deps if rank[room_of(d)] > rank[room_of(m)]
    )  # fmt: skip
    assert [
        f"{m} ({room_of(m)}) imports {d} ({room_of(d)})" for m, d in upward if (m, d) not in KNOWN_ROOM_UPWARD
    ] == []
    assert sorted(set(KNOWN_ROOM_UPWARD) - set(upward)) == [], "gone: take them out of KNOWN_ROOM_UPWARD"
    assert {room_of(d) for d in graph()["repro.judge.evaluate"]} <= {"judge", "contract"}


def test_the_layout_page_states_the_room_order():
    text = (Path(__file__).resolve().parents[1] / "docs" / "layout.md").read_text(encoding="utf-8")
    assert "`" + " < ".join(ROOM_ORDER) + "`" in text


@pytest.mark.parametrize(
    "edges, cycles",
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles_through_any_number_of_modules(edges, cycles):
    assert _cycles(edges) == cycles


def test_the_graph_sees_an_import_inside_a_function_and_a_name_taken_from_a_module():
    g = graph()
    assert "repro.run.scheduler" in g["repro.run.launch"]  # `from repro.run import scheduler`
    assert "repro.plan.devices" in g["repro.plan.options"] and "repro.plan.options" in g["repro.plan.arms"]
    assert "repro.publish.summary" not in g["repro.record.report"]  # issue 34: the circle through the read model
